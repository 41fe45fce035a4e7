"""lengthgen: train small transformers on short inputs, test them on long ones."""

__version__ = "0.1.0"
