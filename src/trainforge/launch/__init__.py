"""Starting runs elsewhere: the torchrun launcher of `trainforge train --nproc-per-node/--nnodes` (torchrun.py) and
the job files of `trainforge launch slurm|k8s|skypilot` (manifests.py)."""
