"""A trained run as a Hugging Face folder (`lengthgen export`; docs/export.md): the modelling code
bundled from lengthgen's own (bundle.py), the tokenizer, the model card, the folder written."""
