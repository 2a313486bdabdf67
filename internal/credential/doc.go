// Package credential serves secrets that never enter the guest. The
// operator declares named aliases in $ISOPOD_HOME/credentials.json: the
// one host each may reach, how the secret is presented (bearer, basic, a
// named header), where the secret comes from (an environment variable or a
// file) and which requests it may sign. A run names aliases; they are
// resolved on the host before its VM starts ([Resolve]), and the gateway's
// credential endpoint ([Gateway], port [EndpointPort]) makes a new HTTPS
// request to the alias's host for each request the guest sends to
// $ISOPOD_CREDENTIAL_ENDPOINT/<alias>/<path>, with the secret added.
//
// A [Secret] cannot be printed, formatted, logged or serialised: its value
// leaves this package only in the request header the gateway writes.
package credential
