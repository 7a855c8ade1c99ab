"""What the data stage keeps on disk, each format in its module: an image folder's scan (`manifest`), a corpus'
memory-mapped token shards (`token_shards`), WebDataset tar shards (`tar_shards`). Imports nothing: the token shards'
pool workers import only what they use, and no torch."""
