package redistest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// TLSFiles are the PEM files a client needs to reach a server from StartTLS.
// They are paths rather than loaded certificates because the code under test
// is usually configured with file names.
type TLSFiles struct {
	// CA is the certificate of the throwaway authority that signed both the
	// server's and the client's certificates: trust it to verify the server.
	CA string
	// ClientCert and ClientKey make up the client certificate the server
	// demands (it runs with tls-auth-clients yes).
	ClientCert string
	ClientKey  string
	// ServerName is a name the server certificate is valid for; the
	// certificate also holds the IP address 127.0.0.1.
	ServerName string
}

// Config loads the files into a client configuration that verifies the
// server and presents the client certificate, for code that takes a
// *tls.Config (redis.Options.TLSConfig) rather than file names.
func (f *TLSFiles) Config() (*tls.Config, error) {
	caPEM, err := os.ReadFile(f.CA)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, fmt.Errorf("no certificate in %s", f.CA)
	}
	cert, err := tls.LoadX509KeyPair(f.ClientCert, f.ClientKey)
	if err != nil {
		return nil, err
	}
	return &tls.Config{
		RootCAs:      pool,
		Certificates: []tls.Certificate{cert},
		ServerName:   f.ServerName,
		MinVersion:   tls.VersionTLS12,
	}, nil
}

// StartTLS runs a redis-server that accepts only TLS connections with a
// client certificate, so that TLS configuration is tested against a server
// that refuses anything less. The certificates are made afresh for each
// test, so none has to be kept in the repository or can expire there.
//
// The server's plain port is off: Addr is its TLS port and URL a rediss://
// URL. Client and the readiness check speak TLS with the client certificate.
func StartTLS(t testing.TB) (*Server, *TLSFiles) {
	t.Helper()
	certDir := t.TempDir()
	files, err := writeTestPKI(certDir)
	if err != nil {
		t.Fatalf("making test certificates: %v", err)
	}
	conf, err := files.Config()
	if err != nil {
		t.Fatalf("loading test certificates: %v", err)
	}
	s := launch(t, conf, func(s *Server) ([]string, error) {
		return append(baseArgs(s),
			"--port", "0", "--tls-port", strconv.Itoa(s.port),
			"--tls-cert-file", filepath.Join(certDir, "server.crt"),
			"--tls-key-file", filepath.Join(certDir, "server.key"),
			"--tls-ca-cert-file", files.CA,
			"--tls-auth-clients", "yes",
		), nil
	})
	return s, files
}

// writeTestPKI writes a CA, a server certificate for localhost and
// 127.0.0.1 and a client certificate, all ECDSA P-256, as PEM files in dir.
func writeTestPKI(dir string) (*TLSFiles, error) {
	now := time.Now()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "redistest CA"},
		NotBefore:             now.Add(-time.Hour), // tolerate clock skew
		NotAfter:              now.Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, err
	}

	leaf := func(serial int64, cn string, usage []x509.ExtKeyUsage, dns []string, ips []net.IP) ([]byte, *ecdsa.PrivateKey, error) {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return nil, nil, err
		}
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(serial),
			Subject:      pkix.Name{CommonName: cn},
			NotBefore:    now.Add(-time.Hour),
			NotAfter:     now.Add(24 * time.Hour),
			KeyUsage:     x509.KeyUsageDigitalSignature,
			ExtKeyUsage:  usage,
			DNSNames:     dns,
			IPAddresses:  ips,
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		return der, key, err
	}
	// The server certificate also allows client use because Redis presents
	// it on its own outgoing TLS links (replication, cluster bus).
	serverDER, serverKey, err := leaf(2, "localhost",
		[]x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		[]string{"localhost"}, []net.IP{net.IPv4(127, 0, 0, 1)})
	if err != nil {
		return nil, err
	}
	clientDER, clientKey, err := leaf(3, "redistest client",
		[]x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, nil, nil)
	if err != nil {
		return nil, err
	}

	f := &TLSFiles{
		CA:         filepath.Join(dir, "ca.crt"),
		ClientCert: filepath.Join(dir, "client.crt"),
		ClientKey:  filepath.Join(dir, "client.key"),
		ServerName: "localhost",
	}
	for _, w := range []struct {
		path string
		der  []byte
		key  *ecdsa.PrivateKey
	}{
		{path: f.CA, der: caDER},
		{path: filepath.Join(dir, "server.crt"), der: serverDER},
		{path: filepath.Join(dir, "server.key"), key: serverKey},
		{path: f.ClientCert, der: clientDER},
		{path: f.ClientKey, key: clientKey},
	} {
		block := &pem.Block{Type: "CERTIFICATE", Bytes: w.der}
		if w.key != nil {
			der, err := x509.MarshalPKCS8PrivateKey(w.key)
			if err != nil {
				return nil, err
			}
			block = &pem.Block{Type: "PRIVATE KEY", Bytes: der}
		}
		if err := os.WriteFile(w.path, pem.EncodeToMemory(block), 0o600); err != nil {
			return nil, err
		}
	}
	return f, nil
}
