"""The `dilstore` command line and job launchers."""
