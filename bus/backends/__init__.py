"""Transports that connect buses across processes, one subpackage each.

Nothing is imported here: each backend imports its own heavy dependency (pyzmq for
``bus.backends.zeromq``) when it is itself imported, so ``import bus`` stays light.
"""
