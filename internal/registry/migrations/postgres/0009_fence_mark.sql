-- mark: the registry's own clock for its owner. The controller that holds the owner's
-- write fence raises it by one every third of the fence's lease (Registry.AdvanceMark),
-- and the cluster keeps the highest it has seen, in a ConfigMap beside the leader
-- election Lease. A registry whose mark is below the cluster's went back in time: an
-- older backup put back, a point-in-time recovery, a failover to a standby that lagged.
ALTER TABLE fences ADD COLUMN mark BIGINT NOT NULL DEFAULT 0 CHECK (mark >= 0);
