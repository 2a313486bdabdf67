package agentproto

import (
	"io/fs"
	"testing"
)

func TestFileKind(t *testing.T) {
	for _, tt := range []struct {
		mode fs.FileMode
		want string
	}{
		{fs.ModeDir, "a directory"},
		{fs.ModeNamedPipe, "a FIFO"},
		{fs.ModeSocket, "a socket"},
		{fs.ModeDevice | fs.ModeCharDevice, "a character device"},
		{fs.ModeDevice, "a block device"},
		{fs.ModeSymlink, "a symlink"},
		{fs.ModeIrregular, "a special file"},
	} {
		if got := FileKind(tt.mode); got != tt.want {
			t.Errorf("FileKind(%v) = %q; want %q", tt.mode, got, tt.want)
		}
	}
}
