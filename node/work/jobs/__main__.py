"""`python -m node.work.jobs > docs/design/states.md`: write the job and unit state
diagrams, generated from the tables in `node.work.jobs.states` (a test fails when the
file in the repository differs from what this prints)."""

import sys

from node.work.jobs.states import document

sys.stdout.write(document())
