"""Where gpudoctor meets a scheduler or monitor: Slurm (slurm), node-problem-detector (npd), Prometheus textfiles
(promfile)."""
