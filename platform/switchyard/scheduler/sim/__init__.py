"""The trace-driven, discrete-event simulator: replays jobs and inference demand through the
same policy core the live scheduler runs (no Ray). Entry point: `sim.run.run(SimSpec)`."""
