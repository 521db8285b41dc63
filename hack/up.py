"""`make up` and `make down`: gymkube running on a cluster in one command, and gone in another.

    .venv/bin/python hack/up.py up      # cluster, images, chart, example pools, a preflight run
    .venv/bin/python hack/up.py down    # undoes `up`

`up` brings up a cluster (kind where Docker can get kind's node image, else the local single-node
cluster of hack/local-cluster.sh), builds the images (`make images`, skipped when nothing that goes
into them changed), loads them into the cluster, installs the chart through pyhelm3, applies the
examples (lighter on a small node), waits on their conditions (printing every change), and prints
each pool's URL and status and the runs' summaries. A failed wait prints operator logs, events and
pod descriptions and saves them to $GYMKUBE_CACHE/up/diagnostics.txt. `down` deletes the
examples, uninstalls the chart, and stops the cluster if `up` started it.

docs/quickstart.md has the details; settings are GYMKUBE_UP_* environment variables. The steps
live in the gymkube_dev package beside this file (docs/development.md maps it).
"""

import sys

from gymkube_dev.cli import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
