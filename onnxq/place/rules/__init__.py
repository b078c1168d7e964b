"""The placement rules: patterns over the graph, each a value, grouped into ordered rule sets per
backend.
"""
