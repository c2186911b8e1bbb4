"""The demo recipe: a data-bound CPU job where the loader's per-sample parsing is the wall."""
