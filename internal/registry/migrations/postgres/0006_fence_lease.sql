-- The write fence becomes a lease: the controller that holds an owner's fence names
-- itself (holder) and renews it until expires_at, in the registry's clock. Another
-- controller of the owner (a clone of the cluster, a second Deployment, a laptop)
-- cannot take the fence while the lease runs: it waits. A graceful stop gives the
-- lease back at once (token 0, holder and expires_at NULL); a crashed holder's lease
-- runs out. A fence of an older controller has neither: free.
ALTER TABLE fences
    ADD COLUMN holder TEXT CHECK (holder <> ''),
    ADD COLUMN expires_at TIMESTAMPTZ;
