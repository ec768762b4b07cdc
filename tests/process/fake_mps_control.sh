#!/usr/bin/env bash
# A test double for NVIDIA's nvidia-cuda-mps-control (the GPU machine has the
# real one; CI has no driver): it keeps a "control" file in
# $CUDA_MPS_PIPE_DIRECTORY while "running", and logs every command with the
# directories it was given to $CUDA_MPS_LOG_DIRECTORY/control.log.
set -euo pipefail
log=$CUDA_MPS_LOG_DIRECTORY/control.log
ctl=$CUDA_MPS_PIPE_DIRECTORY/control
if [ "${1:-}" = "-d" ]; then
  echo "start pipe=$CUDA_MPS_PIPE_DIRECTORY log=$CUDA_MPS_LOG_DIRECTORY" >>"$log"
  : >"$ctl"
  exit 0
fi
[ -e "$ctl" ] || { echo "no control daemon" >&2; exit 1; }
read -r cmd
echo "command $cmd" >>"$log"
case $cmd in
  get_server_list) exit 0 ;;
  quit) rm -f "$ctl"; exit 0 ;;
  *) echo "unknown command $cmd"; exit 1 ;;
esac
