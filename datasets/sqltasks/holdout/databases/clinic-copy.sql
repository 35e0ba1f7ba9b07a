-- The same clinic schema with other rows: a second copy, so that an answer that matches the
-- first copy by luck fails here.
CREATE TABLE Owners (OwnerId INTEGER PRIMARY KEY, OwnerName VARCHAR NOT NULL, City VARCHAR NOT NULL, Phone VARCHAR NOT NULL);
CREATE TABLE Pets (PetId INTEGER PRIMARY KEY, OwnerId INTEGER NOT NULL REFERENCES Owners(OwnerId), PetName VARCHAR NOT NULL, Species VARCHAR NOT NULL, BirthYear INTEGER NOT NULL);
CREATE TABLE Vets (VetId INTEGER PRIMARY KEY, VetName VARCHAR NOT NULL, Specialty VARCHAR NOT NULL);
CREATE TABLE Appointments (AppointmentId INTEGER PRIMARY KEY, PetId INTEGER NOT NULL REFERENCES Pets(PetId), VetId INTEGER NOT NULL REFERENCES Vets(VetId), VisitDate DATE NOT NULL, Reason VARCHAR NOT NULL, Cancelled BOOLEAN NOT NULL);
CREATE TABLE Treatments (TreatmentId INTEGER PRIMARY KEY, AppointmentId INTEGER NOT NULL REFERENCES Appointments(AppointmentId), Description VARCHAR NOT NULL, Cost DECIMAL(8,2) NOT NULL);
INSERT INTO Owners VALUES
  (1, 'Ines Duarte', 'Bristol', '0117 555 0201'),
  (2, 'Kwame Asante', 'Bath', '01225 555 0202'),
  (3, 'Rosa Klein', 'Bristol', '0117 555 0203'),
  (4, 'Yusuf Demir', 'Bristol', '0117 555 0204');
INSERT INTO Pets VALUES
  (1, 1, 'Olive', 'cat', 2018),
  (2, 2, 'Max', 'dog', 2014),
  (3, 2, 'Pip', 'hamster', 2023),
  (4, 3, 'Shadow', 'dog', 2011),
  (5, 4, 'Nala', 'cat', 2021),
  (6, 4, 'Rocky', 'dog', 2019),
  (7, 3, 'Comet', 'rabbit', 2022);
INSERT INTO Vets VALUES
  (1, 'Dr. Oliver Grant', 'general'),
  (2, 'Dr. Mei Tanaka', 'surgery');
INSERT INTO Appointments VALUES
  (1, 1, 1, DATE '2024-03-05', 'check-up', FALSE),
  (2, 2, 2, DATE '2024-03-06', 'knee surgery', FALSE),
  (3, 3, 1, DATE '2024-03-14', 'check-up', TRUE),
  (4, 4, 1, DATE '2024-03-21', 'vaccination', FALSE),
  (5, 5, 1, DATE '2024-04-03', 'vaccination', FALSE),
  (6, 2, 2, DATE '2024-04-10', 'follow-up', FALSE),
  (7, 6, 1, DATE '2024-04-17', 'limping', FALSE);
INSERT INTO Treatments VALUES
  (1, 1, 'examination', 38.00),
  (2, 2, 'surgery', 650.00),
  (3, 2, 'pain relief', 31.00),
  (4, 4, 'rabies vaccine', 48.00),
  (5, 5, 'rabies vaccine', 48.00),
  (6, 6, 'examination', 38.00),
  (7, 7, 'x-ray', 120.00),
  (8, 7, 'anti-inflammatory', 19.50);
