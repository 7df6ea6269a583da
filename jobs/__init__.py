"""The control plane: no torch, no UI; used by `adaflash run|gpus|runs attach|stop` and the TUI.

Modules (import what you need; nothing here prints, progress is read back from the run log):
- jobs.gpus:       Inventory / snapshot(): GPUs via NVML (one pass), processes mapped to jobs, host CPU/RAM.
- jobs.assign:     Assignment of roles to GPUs (validated), GpuLeases (per-host flock'd file) between runs.
- jobs.recipe:     load_recipe / parse_recipe: TOML recipes -> Recipe + JobSpec;
                   RecipeError with file:line: key.
  - jobs.recipe_spec: Recipe, JobSpec, ReadyCheck, RestartPolicy, SlurmSpec (validated, serialisable).
  - jobs.recipe_checker / recipe_jobs / placeholders: how the checks collect problems, one job's checks,
    `{vars.NAME}`-style placeholders. jobs.overrides: `--set key=value`. jobs.toml_lines: key -> line.
  - jobs.dag: the `after` graph (order, cycles, ancestors). jobs.argv: `adaflash`/`python`/torchrun argv.
- jobs.supervisor: Supervisor: start/poll/stop/restart job processes in their own groups, readiness, restarts.
- jobs.plan:       prepare -> PreparedRun: a run's plan (exact argv, GPUs, cache preview); creates nothing.
- jobs.launch_plan: the dashboard's Launch form -> a one-job recipe (commands, flags, TOML) or overrides;
                   jobs.launch_checks reads and checks the form's fields.
- jobs.runner:     Runner: supervise a run in this process (leases, the loop, cache reuse); RunResult.
- jobs.detached:   start_detached / launch_detached: the same in a background process; supervise_existing.
- jobs.watch:      run_view / follow_run: read a run back from the run log (jobs, metrics, events, children).
- jobs.control:    supervisor_pid, request_job_action (per-job stop/restart), stop_run: from any process.
- jobs.cache:      JobCache: a finished task with declared outputs is reused by a later run with the same key.
- jobs.progress:   run_progress: step k of n, each step's own progress and timing, for `adaflash run`.
- jobs.slurm:      render_script / SlurmRun: the same recipe as an sbatch script, tracked via squeue/sacct.
- jobs.ports:      port_free, a launch refused when a service's port is taken, readiness answered by the job.
- jobs.watchdog:   the watchdog of a run: stops its jobs and records the end when its supervisor dies.
Processes are started, identified and stopped through `adaflash.procs` (shared with the core).
"""
