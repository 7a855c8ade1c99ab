"""What the pipeline (`data/pipeline.py`) does to a source's pool, in order: `clean`, `split`, `normalize` (fitted on
the train split), `augment` (train split only); then `datasets` (the splits a DataBundle holds) and `loader` (the
samplers and DataLoaders whose order is a function of (seed, epoch))."""
