// Package oci is the registry plumbing image import and stage transfer
// share: credentials from a Docker configuration directory, the options
// every registry call takes (over a transport that gives up on a request
// moving too little, see Stall, and caps manifests at MaxManifestBytes),
// a digest-checking reader, transfer progress, and the classification of
// what a registry answers into errdefs classes.
//
// It reads no environment: the front ends resolve the Docker
// configuration directory (DOCKER_CONFIG, else ~/.docker) and the stall
// settings and pass them in.
package oci
