"""Stage 7, validate: the written model checked against its backend and measured against the float
model.
"""
