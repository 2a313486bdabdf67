package egress

// Reasons. Every verdict, and so every record, carries one. Allowed flows
// carry the reason they were allowed for; refused ones the rule that
// refused them. The list below is the documented vocabulary of the egress
// record (SECURITY.md); a new reason must be added there too.

// Reasons of the NAT policy ([PublicOnly]).
const (
	ReasonPublic     = "public"
	ReasonLANAllowed = "lan_allowed" // private or CGNAT, allowed by AllowLAN
	ReasonDNS        = "dns"         // a DNS query, answered at the gateway
)

// Destination categories as refusal reasons (see [CategoryReason]).
const (
	ReasonPrivate     = "private_destination"
	ReasonCGNAT       = "cgnat_destination"
	ReasonLoopback    = "loopback"
	ReasonLinkLocal   = "link_local"
	ReasonMulticast   = "multicast"
	ReasonUnspecified = "unspecified"
	ReasonBroadcast   = "broadcast"
	ReasonReserved    = "reserved"
	ReasonHost        = "host_address"
	ReasonInvalid     = "invalid_destination"
)

// Reasons of the filtered policy ([Filter]).
const (
	ReasonAllowedHost  = "allowed_host"    // a name the allowlist matches, or an address handed out for one
	ReasonAllowedCIDR  = "allowed_cidr"    // an address in an --allow-cidr range
	ReasonNotAllowed   = "not_allowed"     // a name no rule matches (everything, with --deny-egress)
	ReasonLiteral      = "literal_address" // an address no rule allows and no allowed name resolved to
	ReasonSNIMismatch  = "sni_mismatch"    // TLS server_name missing or not the name the connection is for
	ReasonHostMismatch = "host_mismatch"   // an HTTP request's names missing, not the name the connection is for, or not agreeing
	ReasonNonTCP       = "non_tcp"         // UDP other than DNS to the gateway, ICMP beyond it
	ReasonIPv6         = "ipv6"            // IPv6 destinations: the guest has no IPv6 egress
	ReasonInvalidName  = "invalid_name"    // not a well-formed host name
	ReasonDNSType      = "dns_type"        // a DNS query type other than A and AAAA, or a class other than IN
	ReasonBadRequest   = "bad_request"     // a proxy request isopod does not serve (bad target, https:// URL, ...)
	// ReasonMalformed is a message that does not parse as the protocol it
	// speaks, or that isopod will not pass on because its receiver could
	// read it differently: a DNS message that is not one standard query, an
	// HTTP request head that breaks HTTP/1.1's syntax or has an ambiguous
	// body length, an HTTP/2 stream that does not decode.
	ReasonMalformed = "malformed"
	// ReasonPinnedCredential is a name, address or request for the host of
	// a credential the run injects: only the credential endpoint reaches
	// it, whatever the allow rules say.
	ReasonPinnedCredential = "pinned_credential_host"
	// ReasonCredentialRefused is a credential endpoint request refused
	// (the record's note says by which check).
	ReasonCredentialRefused = "credential_refused"
	// ReasonCredentialAllowed is a credential endpoint request its alias's
	// allow rules permit, made anew to the alias's host.
	ReasonCredentialAllowed = "credential_allowed"
)

// Reasons a network path adds on its own, outside any Policy.
const (
	ReasonGatewayPort  = "gateway_port"  // a port the gateway does not serve
	ReasonFlowLimit    = "flow_limit"    // too many concurrent flows
	ReasonNotForwarded = "not_forwarded" // a protocol the path never forwards (ICMP beyond the gateway)
	ReasonDialFailed   = "dial_failed"   // allowed, but the host could not connect
	ReasonShuttingDown = "shutting_down" // the network is being torn down
)
