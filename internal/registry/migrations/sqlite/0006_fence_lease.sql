-- The write fence becomes a lease: the controller that holds an owner's fence names
-- itself (holder) and renews it until expires_at, in the registry's clock. Another
-- controller of the owner (a clone of the cluster, a second Deployment, a laptop)
-- cannot take the fence while the lease runs: it waits. A graceful stop gives the
-- lease back at once (token 0, holder and expires_at NULL); a crashed holder's lease
-- runs out. expires_at is in the form of strftime('%Y-%m-%d %H:%M:%f'), in UTC, so
-- that text order is time order. A fence of an older controller has neither: free.
ALTER TABLE fences ADD COLUMN holder TEXT CHECK (holder IS NULL OR (typeof(holder) = 'text' AND holder <> ''));
ALTER TABLE fences ADD COLUMN expires_at TIMESTAMP
    CHECK (expires_at IS NULL OR expires_at IS strftime('%Y-%m-%d %H:%M:%f', expires_at));
