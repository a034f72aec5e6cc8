-- Data safety. deletion_policy: what the row's Student asks for when it goes, so that
-- every path that finds a row without its Student (the sweep, the undo of a stale
-- write) deletes only a Delete row and releases any other. NULL until the controller
-- next writes the row from its Student; a row whose policy is unknown is released,
-- never deleted. owner_clusters: the cluster each owner mark belongs to (the UID of
-- its kube-system namespace), bound on first use; a controller watching another
-- cluster refuses to write. fences: each owner's write token, raised by a controller
-- as it starts to write (becomes the leader); every write commits only while the
-- token is still the writer's, so a former leader's late write is rolled back.
-- SQLite checks every row against every CHECK when a column with one is added; rows
-- written past the checks are kept (as in 0002), with the checks off for this
-- connection, which the migration runner then discards.
PRAGMA ignore_check_constraints = ON;
ALTER TABLE students ADD COLUMN deletion_policy TEXT
    CHECK (deletion_policy IS NULL OR deletion_policy IN ('Delete', 'Orphan'));

CREATE TABLE owner_clusters (
    owner    TEXT      NOT NULL PRIMARY KEY CHECK (typeof(owner) = 'text' AND owner <> ''),
    cluster  TEXT      NOT NULL CHECK (typeof(cluster) = 'text' AND cluster <> ''),
    bound_at TIMESTAMP NOT NULL CHECK (bound_at IS datetime(bound_at))
);
CREATE TABLE fences (
    owner TEXT    NOT NULL PRIMARY KEY CHECK (typeof(owner) = 'text' AND owner <> ''),
    token INTEGER NOT NULL CHECK (typeof(token) = 'integer')
);
PRAGMA ignore_check_constraints = OFF;
