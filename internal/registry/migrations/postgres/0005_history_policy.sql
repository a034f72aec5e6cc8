-- The history records the deletion policy each write left the row with: a policy
-- change is on record, with the policy it set. NULL where it is not known (rows of
-- the history before this migration, rows whose policy was not recorded yet).
ALTER TABLE student_history ADD COLUMN deletion_policy TEXT
    CHECK (deletion_policy IN ('Delete', 'Orphan'));
