"""The job queue for a shared GPU server: store, scheduler, runner, HTTP API and dashboard."""
