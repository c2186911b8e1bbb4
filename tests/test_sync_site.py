"""Where a step synchronizes: the whole-step graph's fallback names the user's line (and the
library call it led to), from the stack each recorded warning was raised from."""

from __future__ import annotations

import re
import warnings

import torch

from fastloop.measure.sync_site import user_site, warnings_with_stacks


def _users_step(x):
    return torch.nn.functional.softmax(x)  # no dim: torch warns from inside torch/nn/functional.py


def test_a_warning_from_inside_torch_is_placed_at_the_users_line():
    with warnings_with_stacks() as seen:
        _users_step(torch.ones(2, 3))
    hits = [(w, stack) for w, stack in seen if "softmax" in str(w.message)]
    assert len(hits) == 1
    line = _users_step.__code__.co_firstlineno + 1
    site = user_site(hits[0][1])
    assert site.startswith(f"test_sync_site.py:{line} in _users_step (inside torch/nn/functional.py:"), site
    assert re.fullmatch(r".*\(inside torch/nn/functional\.py:\d+ _?\w*softmax\w*\)", site), site


def test_recorded_warnings_are_not_shown_and_the_filters_come_back(recwarn):
    before = warnings.filters[:]
    with warnings_with_stacks() as seen:
        warnings.warn("once", UserWarning, stacklevel=1)
        warnings.warn("once", UserWarning, stacklevel=1)  # "always": both recorded, none shown
    assert [str(w.message) for w, _ in seen] == ["once", "once"] and len(recwarn) == 0
    assert warnings.filters == before and warnings.showwarning is not None
    warnings.warn("after", UserWarning, stacklevel=1)
    assert [str(w.message) for w in recwarn] == ["after"]


def test_a_stack_with_no_user_frame_has_no_site():
    assert user_site([]) is None
    assert user_site(traceback_of_torch_only()) is None


def traceback_of_torch_only():
    from traceback import FrameSummary

    return [FrameSummary(torch.__file__, 1, "x", lookup_line=False)]


def _users_copy(t):
    return torch.tensor(t)  # torch warns from C++ (copy-constructing from a tensor), as the sync debug mode does


def test_a_warning_raised_in_cpp_is_recorded_with_the_users_frame():
    with warnings_with_stacks() as seen:
        _users_copy(torch.ones(2))
    hits = [(w, stack) for w, stack in seen if "copy construct from a tensor" in str(w.message)]
    assert len(hits) == 1, [str(w.message) for w, _ in seen]
    assert user_site(hits[0][1]) == f"test_sync_site.py:{_users_copy.__code__.co_firstlineno + 1} in _users_copy"
