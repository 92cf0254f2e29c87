"""Files shipped with the package (found through `glm5lib.paths`): `corpus.txt`, the text the tiny model's
tokenizer is trained on. No code."""
