"""Write-ahead logs for table ranges. Backends sit behind `log.api`; only `main` picks one."""
