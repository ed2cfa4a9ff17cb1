"""What runs inside a replgate sandbox container: the PID 1 reaper and the kernel launcher."""
