"""SEPO: Safe Equilibrium Policy Optimization for language-model agents in strategic games."""

import logging

__version__ = "0.1.0"

# A library's loggers print only where the application configured logging (a Hydra run does): the command
# line's checks before the run already warn through `warnings`, in one line each.
logging.getLogger(__name__).addHandler(logging.NullHandler())
