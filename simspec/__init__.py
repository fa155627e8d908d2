"""simspec: simulate and tune speculative-decoding verification policies for
vision-language model serving."""

__version__ = "0.1.0"
