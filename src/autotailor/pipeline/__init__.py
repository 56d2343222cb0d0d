"""The steps after compiling, tuning and profiling: search, export, report, and the end-to-end run."""
