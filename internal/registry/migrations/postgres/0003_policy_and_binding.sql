-- Data safety. deletion_policy: what the row's Student asks for when it goes, so that
-- every path that finds a row without its Student (the sweep, the undo of a stale
-- write) deletes only a Delete row and releases any other. NULL until the controller
-- next writes the row from its Student; a row whose policy is unknown is released,
-- never deleted. owner_clusters: the cluster each owner mark belongs to (the UID of
-- its kube-system namespace), bound on first use; a controller watching another
-- cluster refuses to write. fences: each owner's write token, raised by a controller
-- as it starts to write (becomes the leader); every write commits only while the
-- token is still the writer's, so a former leader's late write is rolled back.
-- NOT VALID: the new column is NULL everywhere, nothing to check, and no scan of the
-- table under its lock.
ALTER TABLE students
    ADD COLUMN deletion_policy TEXT,
    ADD CONSTRAINT students_deletion_policy CHECK (deletion_policy IN ('Delete', 'Orphan')) NOT VALID;

CREATE TABLE owner_clusters (
    owner    TEXT        NOT NULL PRIMARY KEY CHECK (owner <> ''),
    cluster  TEXT        NOT NULL CHECK (cluster <> ''),
    bound_at TIMESTAMPTZ NOT NULL CHECK (isfinite(bound_at))
);

CREATE TABLE fences (
    owner TEXT   NOT NULL PRIMARY KEY CHECK (owner <> ''),
    token BIGINT NOT NULL
);
