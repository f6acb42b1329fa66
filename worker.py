"""Run an exactcall worker: ``python worker.py --task-queue agents --tools myapp.tools
--workflows myapp.workflows:Agent`` (the same as ``exactcall worker ...``)."""

import sys

from exactcall._cli import main

if __name__ == "__main__":
    sys.exit(main(["worker", *sys.argv[1:]]))
