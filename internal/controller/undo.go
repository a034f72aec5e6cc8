package controller

// Undoing production's past (a row ahead rewound, a released row taken back, a
// deleted row written again) is what an etcd restore calls for, and what a clone of
// the cluster would do to production's registry: decide confirms each with the API
// server first, and counts it against Config.MaxRewinds here.

// takeUndo takes one of the Config.MaxRewinds undos for a write about to be made; it
// takes none and returns false once all are taken. Workers sync in parallel: a check
// before the write and a count after it would let each of them pass the last undo.
func (c *Controller) takeUndo() bool {
	for {
		n := c.rewound.Load()
		if n >= int64(c.cfg.MaxRewinds) {
			return false
		}
		if c.rewound.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

// giveUndoBack returns an undo that takeUndo took for a write that failed.
func (c *Controller) giveUndoBack() { c.rewound.Add(-1) }
