"""The folder a child process gets first on PYTHONPATH: its ``sitecustomize`` starts the audit.

Only :mod:`.sitecustomize` is meant to be imported from here, by Python's ``site`` at start-up.
"""
