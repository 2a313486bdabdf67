package session

import "isopod/internal/paths"

// DiskBytes is the disk session id's directory takes: its allocated
// blocks (st_blocks), so that a sparse disk counts what it holds, not
// its size.
func (s Store) DiskBytes(id string) int64 { return paths.DirBytes(s.SessionDir(id)) }
