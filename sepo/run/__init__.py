"""The run layer: what turns a command line into a run dir, above the stages and the library.

`cli` is the Hydra app (`python main.py`, the `sepo` command); `compose` and `schema` build the typed config;
`config` (with `model_fit`) checks it before any work and words every refusal as one line; `task` runs one
stage in its run dir (the lock, the settings it must match to be reused or resumed, `DONE`/`FAILED`);
`sweep` and `snapshot` keep a multirun's status and what a refused launch may remove; `threads` sets the
torch threads a job gets. The run dir's own records (`sepo.run_lock`, `sepo.reuse`, `sepo.files`) stay in
the library, where the analysis that reads run dirs finds them too.
"""
