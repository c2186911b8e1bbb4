#!/usr/bin/env bash
# Ran in round 10 as call 5 (b208e68): the JPEGs were already there.
# Round 10, device call 4 (carries .dali4): waits for call 3's JPEG generation to finish.
set -u
T0=$SECONDS
mkdir -p /tmp/dw && cp .dali4/* /tmp/dw/
for i in $(seq 1 ${WAIT_S:-150}); do [ -f /tmp/imnet/MANIFEST ] && break; sleep 1; done
ls /tmp/imnet 2>&1 | head -3; tail -2 /tmp/imnet_generate.txt 2>&1
echo "total $((SECONDS-T0)) s"
