package warmpool

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"isopod/internal/image"
)

// Take puts a new snapshot of id in the catalog: it stages a directory
// (Stage), has write fill it, moves an assembled snapshot VM's scratch
// disk (scratch, "" for none) into it as ScratchFile once the VMM is
// gone, and publishes it with meta's result (Publish). A failure leaves
// no staged directory behind.
func (c *Catalog) Take(ctx context.Context, id string, write func(tmp string) error, scratch string, meta func() *Meta) (*Meta, error) {
	tmp, err := c.Stage(id)
	if err != nil {
		return nil, err
	}
	published := false
	defer func() {
		if !published {
			os.RemoveAll(tmp)
		}
	}()
	if err := write(tmp); err != nil {
		return nil, err
	}
	if scratch != "" {
		if err := keepScratch(scratch, tmp); err != nil {
			return nil, err
		}
	}
	m := meta()
	if err := c.Publish(ctx, tmp, m); err != nil {
		return nil, err
	}
	published = true
	return m, nil
}

// keepScratch moves the scratch disk src into the snapshot directory tmp.
func keepScratch(src, tmp string) error {
	dst := filepath.Join(tmp, ScratchFile)
	if err := os.Rename(src, dst); err == nil {
		return nil
	}
	if err := image.CopySparse(dst, src); err != nil {
		return fmt.Errorf("keeping the snapshot's scratch disk: %w", err)
	}
	os.Remove(src)
	return nil
}
