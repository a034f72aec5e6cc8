-- mark: the registry's own clock for its owner. The controller that holds the owner's
-- write fence raises it by one every third of the fence's lease (Registry.AdvanceMark),
-- and the cluster keeps the highest it has seen, in a ConfigMap beside the leader
-- election Lease. A registry whose mark is below the cluster's went back in time: an
-- older backup put back, a point-in-time recovery, a failover to a standby that lagged.
-- SQLite checks every row against every CHECK when a column with one is added; a
-- fence written past the checks is kept (as in 0003), with the checks off for this
-- connection, which the migration runner then discards.
PRAGMA ignore_check_constraints = ON;
ALTER TABLE fences ADD COLUMN mark INTEGER NOT NULL DEFAULT 0 CHECK (typeof(mark) = 'integer' AND mark >= 0);
PRAGMA ignore_check_constraints = OFF;
