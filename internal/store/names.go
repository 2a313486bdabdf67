package store

import (
	"encoding/hex"
	"fmt"
	"hash/fnv"
	"strings"
)

// Vanity names are "adjective-noun", picked from the stage id, so a stage
// keeps its name wherever its id is computed. A name already used by another
// stage (as name or label) gets a "-2", "-3", ... suffix.

var adjectives = []string{
	"amber", "briny", "bubbly", "calm", "curious", "dappled", "drifting",
	"dusky", "foamy", "frilly", "gentle", "glassy", "glossy", "golden",
	"hidden", "indigo", "jolly", "knobbly", "lucky", "merry", "misty",
	"moonlit", "mossy", "nimble", "patient", "pearly", "pebbly", "plucky",
	"quiet", "rocky", "rosy", "ruddy", "salty", "sandy", "shy", "silver",
	"sleepy", "speckled", "spiny", "spotted", "striped", "sunlit", "swift",
	"tawny", "teal", "tidal", "tiny", "wandering", "wavy", "windswept",
}

var nouns = []string{
	"abalone", "amphipod", "anemone", "barnacle", "blenny", "brittlestar",
	"chiton", "clam", "clingfish", "cockle", "conch", "copepod", "cowrie",
	"driftwood", "dulse", "dunlin", "eelgrass", "goby", "hermit", "isopod",
	"kelp", "krill", "limpet", "lugworm", "mussel", "mysid", "nudibranch",
	"oyster", "pebble", "periwinkle", "pipefish", "plover", "prawn",
	"ragworm", "salp", "sanddollar", "sandhopper", "scallop", "sculpin",
	"seaglass", "seahorse", "seasquirt", "shrimp", "sponge", "starfish",
	"tellin", "tubeworm", "turnstone", "urchin", "whelk",
}

// baseName returns the un-suffixed vanity name for a stage id.
func baseName(id string) string {
	raw, err := hex.DecodeString(strings.TrimPrefix(id, IDPrefix))
	if err != nil || len(raw) < 8 {
		return "nameless-" + strings.TrimPrefix(id, IDPrefix)
	}
	a := uint32(raw[0])<<24 | uint32(raw[1])<<16 | uint32(raw[2])<<8 | uint32(raw[3])
	n := uint32(raw[4])<<24 | uint32(raw[5])<<16 | uint32(raw[6])<<8 | uint32(raw[7])
	return adjectives[a%uint32(len(adjectives))] + "-" + nouns[n%uint32(len(nouns))]
}

// StageName returns id's vanity name, suffixed as needed so it differs from
// every name and label in taken.
func StageName(id string, taken map[string]bool) string {
	name := baseName(id)
	if !taken[name] {
		return name
	}
	for i := 2; ; i++ {
		if n := fmt.Sprintf("%s-%d", name, i); !taken[n] {
			return n
		}
	}
}

// VanityName returns an adjective-noun name derived from any identifier
// (VM ids use it too). It is not unique; callers that need uniqueness
// suffix it.
func VanityName(id string) string {
	h := fnv.New64a()
	h.Write([]byte(id))
	v := h.Sum64()
	return adjectives[uint32(v>>32)%uint32(len(adjectives))] + "-" + nouns[uint32(v)%uint32(len(nouns))]
}
