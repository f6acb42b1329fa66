"""Run an exactcall worker: ``python worker.py --task-queue agents --tools myapp.tools
--workflows myapp.workflows:Agent`` (the same as ``exactcall worker ...``)."""

import sys

from exactcall.cli._main import entry

if __name__ == "__main__":
    sys.argv[1:1] = ["worker"]
    entry()
