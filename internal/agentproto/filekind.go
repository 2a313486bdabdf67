package agentproto

import "io/fs"

// FileKind names the type of a file that is not regular ("a FIFO", "a
// directory", ...), as the guest's and the host's refusals of such a file
// say it.
func FileKind(mode fs.FileMode) string {
	switch {
	case mode.IsDir():
		return "a directory"
	case mode&fs.ModeNamedPipe != 0:
		return "a FIFO"
	case mode&fs.ModeSocket != 0:
		return "a socket"
	case mode&fs.ModeCharDevice != 0:
		return "a character device"
	case mode&fs.ModeDevice != 0:
		return "a block device"
	case mode&fs.ModeSymlink != 0:
		return "a symlink"
	}
	return "a special file"
}
