"""SEPO: Safe Equilibrium Policy Optimization for language-model agents in strategic games."""

__version__ = "0.1.0"
