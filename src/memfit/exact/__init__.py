"""Heavy, exact paths: meta-device builds with transformers and config downloads from the Hub.

Modules here import torch, transformers or huggingface_hub inside their functions, so importing
``memfit.exact`` itself stays cheap; the pure core imports them only lazily, never at module level.
"""
