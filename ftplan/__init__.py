"""ftplan: will this fine-tune fit on my GPUs, which setup finishes first, and how long will it take?"""
