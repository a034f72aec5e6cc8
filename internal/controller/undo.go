package controller

// Undoing production's past (rewinding a row ahead, taking back a released row, writing
// a deleted one again) is what an etcd restore calls for, but also what a cloned cluster
// would do to production: decide confirms each with the API server; takeUndo caps them.

// takeUndo takes one of the Config.MaxRewinds undos before a write; false once all are
// taken. Workers run in parallel: checking first and counting after the write would let
// each of them pass the last undo.
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
