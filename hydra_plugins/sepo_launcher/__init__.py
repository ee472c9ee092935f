"""The project's sweep launcher (`+launch=local`): each job in a process of its own. Hydra finds launchers
only under the `hydra_plugins` namespace package, hence this package beside `sepo/`."""
