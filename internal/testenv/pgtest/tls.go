package pgtest

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// TLS is what EnableTLS made: a CA of its own, and the server's certificate it signed.
type TLS struct {
	// CAFile is the CA's certificate (PEM), for a client's sslrootcert.
	CAFile string
	// CA is the same, as PEM.
	CA []byte
}

// EnableTLS makes a CA, has it sign a certificate for the server's names (127.0.0.1,
// localhost and any given), and restarts the server with TLS on. Clients that do not ask
// for TLS (sslmode=disable) still connect. The CA's file is in the server's folder,
// readable by all: it is public.
func (s *Server) EnableTLS(ctx context.Context, names ...string) (TLS, error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return TLS{}, err
	}
	now := time.Now()
	caTemplate := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "pgtest CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTemplate, caTemplate, &caKey.PublicKey, caKey)
	if err != nil {
		return TLS{}, err
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		return TLS{}, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return TLS{}, err
	}
	server := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "pgtest"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour), KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, DNSNames: []string{"localhost"}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}}
	for _, name := range names {
		if ip := net.ParseIP(name); ip != nil {
			server.IPAddresses = append(server.IPAddresses, ip)
		} else {
			server.DNSNames = append(server.DNSNames, name)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, server, caCert, &key.PublicKey, caKey)
	if err != nil {
		return TLS{}, err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return TLS{}, err
	}
	t := TLS{CAFile: filepath.Join(s.dir, "ca.crt"), CA: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})}
	// The server refuses a key that others may read.
	if err := s.writeFile(filepath.Join(s.dir, "server.key"), string(pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}))); err != nil {
		return TLS{}, err
	}
	if err := s.writeFile(filepath.Join(s.dir, "server.crt"), string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))); err != nil {
		return TLS{}, err
	}
	if err := os.WriteFile(t.CAFile, t.CA, 0o644); err != nil { // #nosec G306 -- a CA certificate is public
		return TLS{}, err
	}
	if err := s.Stop(ctx); err != nil {
		return TLS{}, err
	}
	s.tls = true
	if err := s.Start(ctx); err != nil {
		return TLS{}, fmt.Errorf("start with TLS: %w", err)
	}
	return t, nil
}

// tlsOptions are the server's settings for TLS, when EnableTLS turned it on.
func (s *Server) tlsOptions() string {
	if !s.tls {
		return ""
	}
	return fmt.Sprintf(" -c ssl=on -c ssl_cert_file=%s -c ssl_key_file=%s",
		filepath.Join(s.dir, "server.crt"), filepath.Join(s.dir, "server.key"))
}
