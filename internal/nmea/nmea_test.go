package nmea

import (
	"strings"
	"testing"
)

// A sentence garbled on the wire (its checksum does not match) is no fix:
// one digit off in a coordinate would be a fix metres or kilometres away.
func TestAGarbledSentenceIsSkipped(t *testing.T) {
	const good = "$GPRMC,120000.00,A,5222.0000,N,00454.0000,E,0.0,0.0,010320,,,A*5F"
	garbled := strings.Replace(good, "5222.0000", "5232.0000", 1)
	fixes, err := readRMC(strings.NewReader(good+"\n"+garbled+"\n"), "test")
	if err != nil {
		t.Fatal(err)
	}
	if len(fixes) != 1 || fixes[0].Lat != 52+22.0/60 {
		t.Fatalf("read %+v; want the good sentence's fix only", fixes)
	}
}

// Both recorded traces read whole: every sentence's checksum holds.
func TestTheTracesReadWhole(t *testing.T) {
	for trace, want := range map[string]int{CarTrace: 1653, ParkedTrace: 1201} {
		fixes, err := ReadRMC(trace)
		if err != nil || len(fixes) == 0 || len(fixes) > want {
			t.Errorf("%s: %d fixes, %v; want at most %d RMC sentences' worth", trace, len(fixes), err, want)
		}
	}
}
