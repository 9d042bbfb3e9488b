"""Model families: what makes a family's memory differ, read from its config and transformers' modeling
code.
"""
