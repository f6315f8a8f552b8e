"""Work: jobs, scheduling, leases, execution, blob storage and transfer."""
