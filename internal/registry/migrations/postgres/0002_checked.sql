-- The checks that SQLite's rebuilt table makes, where PostgreSQL's types do not already
-- make them. NOT VALID: rows already there are kept as they are (the controller skips
-- and counts those it cannot read); every new or changed row is checked.
ALTER TABLE students
    ADD CONSTRAINT students_uid_not_empty CHECK (uid <> '') NOT VALID,
    ADD CONSTRAINT students_namespace_not_empty CHECK (namespace <> '') NOT VALID,
    ADD CONSTRAINT students_name_not_empty CHECK (name <> '') NOT VALID,
    ADD CONSTRAINT students_owner_not_empty CHECK (owner <> '') NOT VALID,
    ADD CONSTRAINT students_times_finite CHECK (isfinite(created_at) AND isfinite(updated_at) AND isfinite(released_at)) NOT VALID;
