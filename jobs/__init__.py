"""The control plane: no torch, no UI; used by `adaflash run|gpus|runs attach|stop` and the TUI.

Modules (import what you need; nothing here prints, progress is read back from the run log):
- jobs.gpus:       Inventory / snapshot(): GPUs via NVML (one pass), processes mapped to jobs, host CPU/RAM.
- jobs.assign:     Assignment of roles to GPUs (validated), GpuLeases (per-host flock'd file) between runs.
- jobs.recipe:     load_recipe / parse_recipe: TOML recipes -> Recipe + JobSpec; RecipeError with file:line: key.
- jobs.supervisor: Supervisor: start/poll/stop/restart job processes in their own groups, readiness, restarts.
- jobs.runner:     prepare -> PreparedRun (plan), Runner (foreground), start_detached / launch_detached,
                   run_view / follow_run (read a run), stop_run, request_job_action (per-job control).
- jobs.cache:      JobCache: a finished task with declared outputs is reused by a later run with the same key.
- jobs.progress:   run_progress: step k of n, each step's own progress and timing, for `adaflash run` displays.
- jobs.slurm:      render_script / SlurmRun: the same recipe as an sbatch script, tracked via squeue/sacct.
- jobs.procs:      pid + create-time identity and verified process-group stops.
"""
