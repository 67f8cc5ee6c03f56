"""The run's services, used by the loop and the commands: atomic, verified checkpoints
(`checkpoint`), graceful stops and exit status (`signals`), metrics, samples and curves
(`logger`, `metrics_file`, `curves`), compile counts, FLOPs and MFU (`perf`)."""
