//go:build linux

package jail

import (
	"bufio"
	"fmt"
	"os"
	"os/user"
	"strconv"
	"strings"

	"isopod/internal/hosttool"
)

// idMode is how the VMM's ids are mapped into its user namespace.
type idMode int

const (
	// mapDirect: the parent writes the maps itself (root maps the system
	// user; a normal user maps only itself).
	mapDirect idMode = iota
	// mapHelper: newuidmap and newgidmap map a subordinate id.
	mapHelper
)

// idPlan says which host ids a jailed VMM runs as. Inside its namespace it
// is uid and gid 0 (with no capabilities); outside it is uid/gid.
type idPlan struct {
	mode idMode
	uid  int
	gid  int
	// groups are host gids kept as supplementary groups (the kvm group,
	// so that /dev/kvm opens); root only.
	groups []int
	// mappers are newuidmap and newgidmap (mapHelper), which unshare
	// runs by name.
	mappers []string
}

// planIDs picks the ids: the system user when isopod runs as root, else a
// subordinate id from /etc/subuid and /etc/subgid (with newuidmap and
// newgidmap), else the user's own ids with a warning.
func planIDs(euid int) (idPlan, []string, error) {
	if euid == 0 {
		u, err := user.Lookup(SystemUser)
		if err != nil {
			return idPlan{}, nil, failed(fmt.Sprintf("isopod runs as root, and jailed VMMs run as the system user %s, which does not exist", SystemUser),
				fmt.Sprintf("create it with `useradd --system --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin %s` (scripts/install.sh and the packages do)", SystemUser))
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if uid == 0 {
			return idPlan{}, nil, failed(fmt.Sprintf("the system user %s has uid 0", SystemUser), "give it an unprivileged uid")
		}
		p := idPlan{mode: mapDirect, uid: uid, gid: gid}
		if g, err := user.LookupGroup("kvm"); err == nil {
			if kvm, err := strconv.Atoi(g.Gid); err == nil {
				p.groups = []int{kvm}
			}
		}
		return p, nil, nil
	}
	name := strconv.Itoa(euid)
	if u, err := user.LookupId(name); err == nil {
		name = u.Username
	}
	sub, serr := subordinate("/etc/subuid", name, euid)
	subg, gerr := subordinate("/etc/subgid", name, euid)
	newuidmap, uerr := hosttool.Find("newuidmap")
	newgidmap, gmerr := hosttool.Find("newgidmap")
	if serr == nil && gerr == nil && uerr == nil && gmerr == nil {
		return idPlan{mode: mapHelper, uid: sub, gid: subg, mappers: []string{newuidmap, newgidmap}}, nil, nil
	}
	warn := fmt.Sprintf("the VMM runs as your own uid %d inside its jail, because %s: an escape from it would act as you; "+
		"give %s a subordinate range (`sudo usermod --add-subuids 100000-165535 --add-subgids 100000-165535 %s`) and install uidmap",
		euid, firstErr(serr, gerr, uerr, gmerr), name, name)
	return idPlan{mode: mapDirect, uid: euid, gid: os.Getegid()}, []string{warn}, nil
}

func firstErr(errs ...error) error {
	for _, e := range errs {
		if e != nil {
			return e
		}
	}
	return nil
}

// subordinate returns the first id of the first range that /etc/subuid (or
// subgid) at path grants the user name (or uid).
func subordinate(path, name string, uid int) (int, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, fmt.Errorf("%s cannot be read (%v)", path, err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Split(strings.TrimSpace(sc.Text()), ":")
		if len(fields) != 3 || (fields[0] != name && fields[0] != strconv.Itoa(uid)) {
			continue
		}
		start, err1 := strconv.Atoi(fields[1])
		count, err2 := strconv.Atoi(fields[2])
		if err1 == nil && err2 == nil && count > 0 && start > 0 {
			return start, nil
		}
	}
	return 0, fmt.Errorf("%s grants %s no range", path, name)
}
