"""Images as the models take them: `read` (a file into an array), `preprocess` (a pretrained model's resize, crop and
normalization). numpy and Pillow only, no torch at import: `trainforge predict` serves with them."""
